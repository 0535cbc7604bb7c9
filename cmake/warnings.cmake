add_library(onceproxy_warnings INTERFACE)
target_compile_options(onceproxy_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wconversion -Wshadow -Wno-sign-conversion
  # g++ 12 reports Asio's coroutine frame allocation falsely (operator new/delete pairs).
  $<$<CXX_COMPILER_ID:GNU>:-Wno-mismatched-new-delete>
  $<$<BOOL:${ONCEPROXY_WERROR}>:-Werror>)
