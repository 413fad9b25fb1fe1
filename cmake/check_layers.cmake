# Layering check, run at configure time (include()) and by the dynemb_check_layers target at
# every build (cmake -DDYNEMB_ROOT=... -P): no file of cli/ includes a CUDA, CUB or NCCL header
# or a kernels/ header, and lib/ includes nothing of kernels/, backends/ or bench/.
if(NOT DYNEMB_ROOT)
  set(DYNEMB_ROOT ${PROJECT_SOURCE_DIR})
endif()
function(dynemb_forbid_includes dir regex why)
  file(GLOB_RECURSE files ${DYNEMB_ROOT}/${dir}/*.cpp ${DYNEMB_ROOT}/${dir}/*.hpp)
  foreach(f ${files})
    file(STRINGS ${f} hits REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"](${regex})")
    if(hits)
      file(RELATIVE_PATH rel ${DYNEMB_ROOT} ${f})
      list(GET hits 0 first)
      message(FATAL_ERROR "${rel}: `${first}`: ${why}")
    endif()
  endforeach()
endfunction()
dynemb_forbid_includes(cli "cuda|cub/|nccl|dist_kernels|bucketize|probes|kernels/|cuda/|nccl/|.*[.]cuh"
  "cli/ never includes a CUDA, CUB or NCCL header: go through backends/registry.hpp or bench/")
dynemb_forbid_includes(lib "cuda|cub/|nccl|dist_kernels|kernels/|backends/|bench/|registry|.*[.]cuh"
  "lib/ is host-only and below kernels/, backends/ and bench/")
