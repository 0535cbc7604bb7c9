# The git commit `onceproxy --version` prints next to PROJECT_VERSION, in ONCEPROXY_COMMIT.
# Given on the command line (-DONCEPROXY_COMMIT=..., as the container build does: its context
# has no .git), it is used as is; otherwise it is read with `git rev-parse` at configure time,
# and CMake re-configures when HEAD moves, so the value follows commits and checkouts.
set(ONCEPROXY_COMMIT "" CACHE STRING "git commit for --version (default: git rev-parse HEAD)")
set(ONCEPROXY_VERSION_COMMIT "${ONCEPROXY_COMMIT}")
if(NOT ONCEPROXY_VERSION_COMMIT)
  find_package(Git QUIET)
  if(GIT_FOUND)
    execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --short=12 HEAD
                    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
                    OUTPUT_VARIABLE ONCEPROXY_VERSION_COMMIT RESULT_VARIABLE _git_rc
                    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --absolute-git-dir
                    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
                    OUTPUT_VARIABLE _git_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(NOT _git_rc EQUAL 0)
      set(ONCEPROXY_VERSION_COMMIT "")
    elseif(EXISTS "${_git_dir}/logs/HEAD")
      # Appended to by every commit, checkout and reset of this worktree.
      set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
                   "${_git_dir}/logs/HEAD")
    endif()
  endif()
endif()
if(NOT ONCEPROXY_VERSION_COMMIT)
  set(ONCEPROXY_VERSION_COMMIT unknown)
endif()
