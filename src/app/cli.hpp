#pragma once
// Command line: --config FILE, --check-config FILE..., --port-file PATH, --version, --help.

namespace onceproxy::app {

/// Runs the program; returns the process exit status.
int run_cli(int argc, char** argv);

} // namespace onceproxy::app
