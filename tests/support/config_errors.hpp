#pragma once
// For config unit tests: the errors load_string reports about a YAML text, and a file to point
// a `*_file` setting at, and a CA certificate to put in one.

#include "onceproxy/config/load.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace onceproxy::test {

/// An upstream and a catch-all route: the least a config needs (two lines; a test's own section
/// starts at line 3).
inline constexpr const char* minimal_config =
    "upstreams: { app: { url: \"http://127.0.0.1:3000\" } }\n"
    "routes: [ { name: all, match: { prefix: / }, upstream: app } ]\n";

/// The errors load_string threw for `yaml` (file name "test.yaml"), or none when it loaded.
inline std::vector<config::config_error> errors_of(const std::string& yaml) {
    try {
        config::load_string(yaml, "test.yaml");
    } catch (const config::config_errors& e) {
        return e.errors();
    }
    return {};
}

/// `errors`, one a line.
inline std::string describe(const std::vector<config::config_error>& errors) {
    std::string out;
    for (const auto& e : errors) {
        out += e.to_string() + "\n";
    }
    return out;
}

/// The one error of `yaml`, which must be at `line` (1-based, with a column) and say `text`.
inline void check_one_error(const std::string& yaml, int line, const std::string& text) {
    const auto errors = errors_of(yaml);
    CAPTURE(describe(errors));
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].file == "test.yaml");
    CHECK(errors[0].line == line);
    CHECK(errors[0].column > 0);
    CHECK(errors[0].to_string().find(text) != std::string::npos);
}

/// A self-signed CA certificate (EC P-256, valid until 2126): the content of a CA file that
/// loads.
inline constexpr const char* ca_certificate_pem =
    "-----BEGIN CERTIFICATE-----\n"
    "MIIBmjCCAT+gAwIBAgIUVHRlLfWTiLoAeOO9pBJjO6eZpwkwCgYIKoZIzj0EAwIw\n"
    "ITEfMB0GA1UEAwwWb25jZXByb3h5IHVuaXQgdGVzdCBDQTAgFw0yNjExMjcwNzE2\n"
    "NThaGA8yMTI2MTEwMzA3MTY1OFowITEfMB0GA1UEAwwWb25jZXByb3h5IHVuaXQg\n"
    "dGVzdCBDQTBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABP0erKomXcnEpevCRvIT\n"
    "QAj5G9cnHECZWpiunP6c4SfLixi68gA+AjRpbFjN3JOYYfvAEMOdXONq/NAWRmqQ\n"
    "1pOjUzBRMB0GA1UdDgQWBBStYV8pXCJePCVjrnyjI1lK8chk/DAfBgNVHSMEGDAW\n"
    "gBStYV8pXCJePCVjrnyjI1lK8chk/DAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49\n"
    "BAMCA0kAMEYCIQDtTSC9j2af5RZl+NO1UT8QIjfCIxp/NCPPloCTI6uLYwIhAK44\n"
    "J4gMUKRP5ZJfXnUW0zkTSGxMHMJIBsX8b8oOLBRM\n"
    "-----END CERTIFICATE-----\n";

/// A file under /tmp holding `content`, removed at scope exit.
struct temp_file {
    std::string path;
    explicit temp_file(const std::string& content) {
        static unsigned n = 0;
        path = "/tmp/onceproxy-unit-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
        std::ofstream(path, std::ios::binary) << content;
    }
    ~temp_file() { std::remove(path.c_str()); }
    temp_file(const temp_file&) = delete;
    temp_file& operator=(const temp_file&) = delete;
};

} // namespace onceproxy::test
