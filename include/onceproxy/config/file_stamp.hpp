#pragma once
// What tells a changed file apart without reading it: a Kubernetes ConfigMap or Secret update
// swaps a symlink (a new inode), an edit changes the size or the modification time. Used to
// watch the config file and the certificate files the proxy has loaded.

#include <cstdint>
#include <string>

namespace onceproxy::config {

struct file_stamp {
    std::uint64_t device = 0;
    std::uint64_t inode = 0;
    std::int64_t size = 0;
    std::int64_t mtime_ns = 0;

    /// All zero: the file could not be stat'ed (missing, for a moment mid-swap, or unreadable).
    bool missing() const { return *this == file_stamp{}; }
    bool operator==(const file_stamp&) const = default;
};

/// The stamp of `path`, following symlinks; all zero when it cannot be stat'ed.
file_stamp file_stamp_of(const std::string& path);

} // namespace onceproxy::config
