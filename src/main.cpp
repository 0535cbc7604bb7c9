// Parses argv, loads the config and hands over to app/. Nothing else lives here.
#include "app/cli.hpp"

int main(int argc, char** argv) {
    return onceproxy::app::run_cli(argc, argv);
}
