# EDGE_VERSION_STRING: the project version plus the git commit it was configured from.
set(EDGE_GIT_COMMIT "unknown")
find_package(Git QUIET)
if(GIT_FOUND AND EXISTS "${CMAKE_SOURCE_DIR}/.git")
  execute_process(COMMAND "${GIT_EXECUTABLE}" rev-parse --short=12 HEAD
    WORKING_DIRECTORY "${CMAKE_SOURCE_DIR}"
    OUTPUT_VARIABLE _edge_commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
    RESULT_VARIABLE _edge_git_rc)
  if(_edge_git_rc EQUAL 0 AND _edge_commit)
    set(EDGE_GIT_COMMIT "${_edge_commit}")
  endif()
endif()
set(EDGE_VERSION_STRING "${PROJECT_VERSION}")
