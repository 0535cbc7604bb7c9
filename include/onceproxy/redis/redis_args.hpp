#pragma once
// The arguments of one Redis command, viewed: `[0]` is the command name, and every argument is
// binary-safe bytes. Nothing is copied until the command is encoded into the connection's
// write buffer, so a caller builds a command from the strings it already holds (a key, an
// owner, a record of any size) in an array on its own frame.

#include <array>
#include <cstddef>
#include <initializer_list>
#include <ranges>
#include <string_view>
#include <type_traits>

namespace onceproxy::redis {

template <class Range>
concept views_range =
    std::ranges::contiguous_range<const Range> && std::ranges::sized_range<const Range> &&
    std::is_same_v<std::ranges::range_value_t<const Range>, std::string_view>;

class redis_args {
public:
    redis_args() = default;
    /// `{"GET", key}`, where the call's arguments are not used after it returns. GCC 12 refuses
    /// a braced list in a co_await expression: there, use command().
    redis_args(std::initializer_list<std::string_view> args) noexcept : size_(args.size()) {
        data_ = args.begin(); // the list lives until the end of the caller's full-expression
    }
    /// Any contiguous range of string_views (std::array, std::vector, std::span).
    template <views_range Range>
    redis_args(const Range& args) noexcept
        : data_(std::ranges::data(args)), size_(std::ranges::size(args)) {}

    const std::string_view* begin() const noexcept { return data_; }
    const std::string_view* end() const noexcept { return data_ + size_; }
    std::size_t size() const noexcept { return size_; }
    bool empty() const noexcept { return size_ == 0; }
    const std::string_view& operator[](std::size_t i) const noexcept { return data_[i]; }

private:
    const std::string_view* data_ = nullptr;
    std::size_t size_ = 0;
};

/// The arguments of one command, e.g. `command("GET", key)`: an array of views, to keep alive
/// while a call reads them (a temporary in a co_await expression lives until it completes).
template <class... Args>
std::array<std::string_view, sizeof...(Args)> command(const Args&... args) noexcept {
    return {std::string_view(args)...};
}

} // namespace onceproxy::redis
