#include "onceproxy/config/load.hpp"

#include "config/config_reader.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace onceproxy::config {
namespace {

std::string join(const std::vector<config_error>& errors) {
    std::string out = std::to_string(errors.size()) +
                      (errors.size() == 1 ? " configuration error" : " configuration errors");
    for (const auto& e : errors) {
        out += "\n";
        out += e.to_string();
    }
    return out;
}

int one_based(int zero_based) {
    return zero_based < 0 ? 0 : zero_based + 1;
}

} // namespace

std::string config_error::to_string() const {
    std::string out = file;
    if (line > 0) {
        out += ":" + std::to_string(line);
        if (column > 0) {
            out += ":" + std::to_string(column);
        }
    }
    out += ": ";
    if (!path.empty()) {
        out += path + ": ";
    }
    out += message;
    return out;
}

config_errors::config_errors(std::vector<config_error> errors)
    : std::runtime_error(join(errors)), errors_(std::move(errors)) {}

std::shared_ptr<const config> load_string(const std::string& yaml, const std::string& file) {
    std::vector<config_error> errors;
    std::vector<YAML::Node> documents;
    try {
        documents = YAML::LoadAll(yaml);
    } catch (const YAML::Exception& e) {
        // A syntax error stops yaml-cpp: this is the only case reported alone.
        errors.push_back(config_error{file, one_based(e.mark.line), one_based(e.mark.column), "",
                                      "YAML syntax error: " + e.msg});
        throw config_errors(std::move(errors));
    }
    if (documents.empty()) {
        errors.push_back(config_error{file, 0, 0, "",
                                      "the file is empty; expected a mapping with at least "
                                      "'upstreams' and 'routes'"});
        throw config_errors(std::move(errors));
    }
    if (documents.size() > 1) {
        const YAML::Mark m = documents[1].Mark();
        errors.push_back(config_error{file, one_based(m.line), one_based(m.column), "",
                                      "expected a single YAML document, found " +
                                          std::to_string(documents.size())});
    }
    auto cfg = std::make_shared<config>(read_config(documents.front(), file, errors));
    if (!errors.empty()) {
        // Report in file order, whatever order the sections were checked in.
        std::stable_sort(errors.begin(), errors.end(),
                         [](const config_error& a, const config_error& b) {
                             return std::tie(a.line, a.column) < std::tie(b.line, b.column);
                         });
        throw config_errors(std::move(errors));
    }
    return cfg;
}

std::shared_ptr<const config> load_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        const int err = errno;
        throw config_errors({config_error{path, 0, 0, "",
                                          std::string{"cannot open the file: "} +
                                              (err != 0 ? std::strerror(err) : "unknown error")}});
    }
    std::ostringstream text;
    text << in.rdbuf();
    if (in.bad()) {
        throw config_errors({config_error{path, 0, 0, "", "cannot read the file"}});
    }
    return load_string(text.str(), path);
}

} // namespace onceproxy::config
