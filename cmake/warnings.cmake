add_library(onceproxy_warnings INTERFACE)
target_compile_options(onceproxy_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wconversion -Wshadow -Wno-sign-conversion
  $<$<BOOL:${ONCEPROXY_WERROR}>:-Werror>)
