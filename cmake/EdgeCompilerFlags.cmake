# Warning and sanitizer flags shared by every edgeinfer target (edge_apply_flags).

set(EDGE_CXX_WARNINGS
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Woverloaded-virtual
  -Wimplicit-fallthrough -Wformat=2 -Wcast-qual -Wmissing-declarations
  # GCC 12 warns on designated initializers that leave members to their defaults.
  -Wno-missing-field-initializers)
if(EDGE_WERROR)
  list(APPEND EDGE_CXX_WARNINGS -Werror)
endif()

if(EDGE_SANITIZE)
  string(REPLACE ";" "," _edge_sanitizers "${EDGE_SANITIZE}")
  set(EDGE_SANITIZE_FLAGS -fsanitize=${_edge_sanitizers} -fno-omit-frame-pointer -fno-sanitize-recover=all)
endif()

# Applies warnings (and sanitizers, when asked) to a target's C++ sources. CUDA sources get
# their own warning set in EdgeCuda.cmake; sanitizers are host-only.
function(edge_apply_flags target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${EDGE_CXX_WARNINGS}>)
  if(EDGE_SANITIZE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${EDGE_SANITIZE_FLAGS}>)
    get_target_property(_type ${target} TYPE)
    if(_type STREQUAL "EXECUTABLE" OR _type STREQUAL "SHARED_LIBRARY")
      target_link_options(${target} PRIVATE ${EDGE_SANITIZE_FLAGS})
    endif()
  endif()
endfunction()
