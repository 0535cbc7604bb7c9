#include "support/test_pki.hpp"

#include "support/process.hpp"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace onceproxy::test {

namespace {

void write_file(const std::string& path, const std::string& content) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << content;
    if (!out) {
        throw std::runtime_error("cannot write " + path);
    }
}

} // namespace

std::string run_openssl(const std::vector<std::string>& args) {
    std::string command = "openssl";
    for (const auto& a : args) {
        command += ' ';
        command += shell_quote(a);
    }
    command += " 2>&1";
    FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) {
        throw std::runtime_error("cannot run: " + command);
    }
    std::string output;
    std::array<char, 4096> buffer{};
    while (std::size_t n = std::fread(buffer.data(), 1, buffer.size(), pipe)) {
        output.append(buffer.data(), n);
    }
    const int status = ::pclose(pipe);
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        throw std::runtime_error("openssl failed: " + command + "\n" + output);
    }
    return output;
}

test_pki::test_pki(std::string dir, std::string name)
    : dir_(std::move(dir)), name_(std::move(name)), ca_cert_(dir_ + "/" + name_ + ".pem"),
      ca_key_(dir_ + "/" + name_ + ".key") {
    run_openssl({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", ca_key_, "-out", ca_cert_, "-days", "365", "-subj", "/CN=" + name_,
                 "-addext", "basicConstraints=critical,CA:TRUE", "-addext",
                 "keyUsage=critical,keyCertSign,cRLSign"});
}

cert_pair test_pki::issue(const std::string& file_stem, const leaf_options& options) const {
    const std::string base = dir_ + "/" + file_stem;
    cert_pair out{base + ".pem", base + ".key", base + ".leaf.pem"};
    const std::string csr = base + ".csr";
    const std::string ext = base + ".ext";
    run_openssl({"req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", out.key_file, "-out", csr, "-subj", "/CN=" + options.common_name});
    std::string extensions = "basicConstraints=CA:FALSE\n";
    extensions +=
        options.client ? "extendedKeyUsage=clientAuth\n" : "extendedKeyUsage=serverAuth\n";
    if (!options.alt_names.empty()) {
        extensions += "subjectAltName=";
        for (std::size_t i = 0; i < options.alt_names.size(); ++i) {
            extensions += (i == 0 ? "" : ",") + options.alt_names[i];
        }
        extensions += '\n';
    }
    write_file(ext, extensions);
    run_openssl({"x509", "-req", "-in", csr, "-CA", ca_cert_, "-CAkey", ca_key_, "-CAcreateserial",
                 "-days", std::to_string(options.days), "-extfile", ext, "-out", out.leaf_file});
    write_file(out.cert_file, read_file(out.leaf_file) + read_file(ca_cert_));
    return out;
}

} // namespace onceproxy::test
