#pragma once
// The proxy's own log (stderr): one JSON object per line, with ts, level, component and msg.

#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>

#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace onceproxy::test {

/// Every line of `log` that is a JSON object with the four members of a process-log line (the
/// access log, on stdout, has no `level`). Lines that are not are skipped.
inline std::vector<boost::json::object> process_log_lines(const std::string& log) {
    std::vector<boost::json::object> out;
    std::istringstream in(log);
    std::string line;
    while (std::getline(in, line)) {
        boost::system::error_code ec;
        auto v = boost::json::parse(line, ec);
        if (ec || !v.is_object()) {
            continue;
        }
        auto& o = v.as_object();
        if (o.contains("ts") && o.contains("level") && o.contains("component") &&
            o.contains("msg")) {
            out.push_back(std::move(o));
        }
    }
    return out;
}

/// The first process-log line whose msg contains `msg_part`.
inline std::optional<boost::json::object> find_log_line(const std::string& log,
                                                        const std::string& msg_part) {
    for (auto& o : process_log_lines(log)) {
        const auto* m = o.if_contains("msg");
        if (m->is_string() && std::string(m->as_string()).find(msg_part) != std::string::npos) {
            return std::move(o);
        }
    }
    return std::nullopt;
}

/// `o[name]` as text: a string's value, a number's decimal form, "" when absent.
inline std::string log_field(const boost::json::object& o, const std::string& name) {
    const auto* m = o.if_contains(name);
    if (m == nullptr) {
        return {};
    }
    if (m->is_string()) {
        return std::string(m->as_string());
    }
    if (m->is_int64()) {
        return std::to_string(m->as_int64());
    }
    if (m->is_uint64()) {
        return std::to_string(m->as_uint64());
    }
    return {};
}

} // namespace onceproxy::test
