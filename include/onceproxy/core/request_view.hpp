#pragma once
// A neutral, read-only view of one HTTP request: what the engine may look at, with no HTTP
// library behind it. The views point into the caller's request, which must outlive this view.

#include <onceproxy/core/fingerprint.hpp>

#include <span>
#include <string_view>
#include <vector>

namespace onceproxy::core {

/// True when `a` and `b` are equal ignoring ASCII case (header names, RFC 9110 §5.1).
[[nodiscard]] bool ascii_iequals(std::string_view a, std::string_view b) noexcept;

struct request_view {
    std::string_view method; ///< upper case as received, e.g. "POST"
    std::string_view target; ///< origin-form path with query, as received
    /// Every header line in arrival order (name, value); names compare case-insensitively.
    std::span<const header_view> headers;
    std::string_view body; ///< the whole body, already de-chunked
    /// The subject of the client's verified TLS certificate; empty when there is none.
    std::string_view client_cert_subject;
    /// The address the request's connection came from (its peer, not a forwarded header).
    std::string_view client_address{};

    /// Values of every line named `name`, in arrival order.
    [[nodiscard]] std::vector<std::string_view> values(std::string_view name) const;
    /// Value of the first line named `name`, or "" when there is none.
    [[nodiscard]] std::string_view value(std::string_view name) const noexcept;
};

} // namespace onceproxy::core
