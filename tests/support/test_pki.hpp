#pragma once
// A throw-away certificate authority for TLS tests, made with the `openssl` command (EC P-256):
// a CA, then leaf certificates it signs (server or client, valid or expired). Every file lands
// in the given directory. A failing openssl run throws: a test FAILS, never skips.

#include <string>
#include <vector>

namespace onceproxy::test {

/// A PEM certificate and its private key.
struct cert_pair {
    std::string cert_file; ///< leaf first, then the issuing CA (a chain, as a Secret holds it)
    std::string key_file;
    std::string leaf_file; ///< the leaf certificate alone
};

struct leaf_options {
    std::string common_name = "localhost";
    /// subjectAltName entries, e.g. "DNS:localhost", "IP:127.0.0.1".
    std::vector<std::string> alt_names{"DNS:localhost", "IP:127.0.0.1"};
    int days = 30;       ///< negative: already expired (notAfter before notBefore)
    bool client = false; ///< extendedKeyUsage clientAuth instead of serverAuth
};

class test_pki {
public:
    /// Creates a CA named `name` ("CN=<name>") in `dir` (which must exist).
    test_pki(std::string dir, std::string name = "onceproxy-test-ca");

    const std::string& ca_file() const noexcept { return ca_cert_; }

    /// Issues a leaf certificate signed by this CA; files are <dir>/<file_stem>.{pem,key}
    /// (chain) and <dir>/<file_stem>.leaf.pem.
    cert_pair issue(const std::string& file_stem, const leaf_options& options = {}) const;

private:
    std::string dir_;
    std::string name_;
    std::string ca_cert_;
    std::string ca_key_;
};

/// Runs `openssl` with `args`; throws std::runtime_error with its output when it fails.
std::string run_openssl(const std::vector<std::string>& args);

} // namespace onceproxy::test
