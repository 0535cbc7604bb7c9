if(ONCEPROXY_SANITIZE)
  string(REPLACE ";" "," _onceproxy_san "${ONCEPROXY_SANITIZE}")
  add_compile_options(-fsanitize=${_onceproxy_san} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${_onceproxy_san})
  if("undefined" IN_LIST ONCEPROXY_SANITIZE)
    # UBSan's vptr check probes the vtable's memory through a pipe(2): out of descriptors (the
    # hostile-input tests exhaust them on purpose) the probe fails and a valid object reads as
    # "invalid vptr" (seen on asio's error categories and cancellation handlers). The other
    # undefined-behaviour checks stay on.
    add_compile_options(-fno-sanitize=vptr)
    add_link_options(-fno-sanitize=vptr)
  endif()
endif()
