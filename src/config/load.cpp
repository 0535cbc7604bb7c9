#include "onceproxy/config/load.hpp"

#include "config/config_reader.hpp"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
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

/// Where the first node of a document starts.
struct first_mark_probe : YAML::EventHandler {
    std::optional<YAML::Mark> first;
    void seen(const YAML::Mark& m) {
        if (!first) {
            first = m;
        }
    }
    void OnDocumentStart(const YAML::Mark&) override {}
    void OnDocumentEnd() override {}
    void OnNull(const YAML::Mark& m, YAML::anchor_t) override { seen(m); }
    void OnAlias(const YAML::Mark& m, YAML::anchor_t) override { seen(m); }
    void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                  const std::string&) override {
        seen(m);
    }
    void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                         YAML::EmitterStyle::value) override {
        seen(m);
    }
    void OnSequenceEnd() override {}
    void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                    YAML::EmitterStyle::value) override {
        seen(m);
    }
    void OnMapEnd() override {}
};

/// What the stream holds: its first document, how many documents there are (counting stops at
/// 2) and where the second starts. YAML::LoadAll is not used: yaml-cpp 0.7 never returns from it
/// on some malformed input (a stray ',' at the top level yields empty documents forever without
/// consuming a byte), so documents are counted here with a progress check. Throws
/// YAML::Exception on a syntax error.
struct document_scan {
    std::size_t count = 0;
    std::optional<YAML::Mark> second_mark;
    YAML::Node first;
};

document_scan scan_documents(const std::string& yaml) {
    document_scan out;
    std::istringstream in(yaml);
    YAML::Parser parser(in);
    std::streamoff last_end = -2;
    while (out.count < 2) {
        first_mark_probe probe;
        if (!parser.HandleNextDocument(probe)) {
            break;
        }
        const std::streamoff end = in.tellg();
        if (end == last_end) {
            const auto m = probe.first.value_or(YAML::Mark{});
            throw YAML::ParserException(m, "unexpected content outside of any node");
        }
        last_end = end;
        if (++out.count == 2) {
            out.second_mark = probe.first;
        }
    }
    if (out.count > 0) {
        out.first = YAML::Load(yaml);
    }
    return out;
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
    document_scan documents;
    try {
        documents = scan_documents(yaml);
    } catch (const YAML::Exception& e) {
        // A syntax error stops yaml-cpp: this is the only case reported alone.
        errors.push_back(config_error{file, one_based(e.mark.line), one_based(e.mark.column), "",
                                      "YAML syntax error: " + e.msg});
        throw config_errors(std::move(errors));
    }
    if (documents.count == 0) {
        errors.push_back(config_error{file, 0, 0, "",
                                      "the file is empty; expected a mapping with at least "
                                      "'upstreams' and 'routes'"});
        throw config_errors(std::move(errors));
    }
    if (documents.count > 1) {
        const YAML::Mark m = documents.second_mark.value_or(YAML::Mark{});
        errors.push_back(config_error{file, one_based(m.line), one_based(m.column), "",
                                      "expected a single YAML document, found more than one"});
    }
    auto cfg = std::make_shared<config>(read_config(documents.first, file, errors));
    cfg->source_text = yaml;
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
