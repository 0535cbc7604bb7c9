#include "onceproxy/metrics/history.hpp"

#include <algorithm>

namespace onceproxy::metrics {

const route_sample* sample::route(std::string_view name) const noexcept {
    for (const auto& r : routes) {
        if (r.name == name) {
            return &r;
        }
    }
    return nullptr;
}

sample sample_of(const registry& reg, std::chrono::steady_clock::time_point now) {
    sample s{now, {}};
    for (const auto* r : reg.routes()) {
        route_sample rs{r->name, {}, {}, r->histogram(family::request_duration).read()};
        for (std::size_t i = 0; i < rs.requests.size(); ++i) {
            rs.requests[i] = r->cell(family::requests, i);
        }
        for (std::size_t i = 0; i < rs.observed.size(); ++i) {
            rs.observed[i] = r->cell(family::observed, i);
        }
        s.routes.push_back(std::move(rs));
    }
    return s;
}

void history::add(sample s) {
    samples_.push_back(std::move(s));
    while (samples_.size() > keep_) {
        samples_.pop_front();
    }
}

const sample* history::at_least(std::chrono::steady_clock::duration age,
                                std::chrono::steady_clock::time_point now) const noexcept {
    if (samples_.empty()) {
        return nullptr;
    }
    const sample* found = &samples_.front();
    for (const auto& s : samples_) {
        if (now - s.at < age) {
            break;
        }
        found = &s;
    }
    return found;
}

double quantile(double q, const histogram_cells::counts& h) noexcept {
    if (h.count == 0) {
        return -1;
    }
    const double rank = q * static_cast<double>(h.count);
    std::uint64_t below = 0;
    for (std::size_t i = 0; i < h.buckets.size(); ++i) {
        const auto in = h.buckets[i];
        if (in > 0 && static_cast<double>(below + in) >= rank) {
            if (i == latency_buckets.size()) {
                return latency_buckets.back();
            }
            const double lower = i == 0 ? 0.0 : latency_buckets[i - 1];
            const double upper = latency_buckets[i];
            const double into = (rank - static_cast<double>(below)) / static_cast<double>(in);
            return lower + (upper - lower) * std::clamp(into, 0.0, 1.0);
        }
        below += in;
    }
    return latency_buckets.back();
}

histogram_cells::counts difference(const histogram_cells::counts& now,
                                   const histogram_cells::counts& before) noexcept {
    histogram_cells::counts d;
    for (std::size_t i = 0; i < d.buckets.size(); ++i) {
        d.buckets[i] = now.buckets[i] > before.buckets[i] ? now.buckets[i] - before.buckets[i] : 0;
        d.count += d.buckets[i];
    }
    return d;
}

} // namespace onceproxy::metrics
