# Layering check, run at configure time (include()) and by the dynemb_check_layers target at
# every build (cmake -DDYNEMB_ROOT=... -P): no file of cli/ includes a CUDA, CUB or NCCL header
# or a kernels/ header, lib/ includes nothing of kernels/, backends/ or bench/, and HDF5 lives in
# lib/capture alone (no other file includes libhdf5's headers or capture's private ones).
if(NOT DYNEMB_ROOT)
  set(DYNEMB_ROOT ${PROJECT_SOURCE_DIR})
endif()
function(dynemb_forbid_includes dir regex why)
  file(GLOB_RECURSE files ${DYNEMB_ROOT}/${dir}/*.cpp ${DYNEMB_ROOT}/${dir}/*.hpp
       ${DYNEMB_ROOT}/${dir}/*.h ${DYNEMB_ROOT}/${dir}/*.cu ${DYNEMB_ROOT}/${dir}/*.cuh)
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
# libhdf5 is not thread-safe and 1.10 can crash or loop on a damaged file: lib/capture is the
# one place that calls it (capture.hpp, batch_source.hpp and merge.hpp are its public face).
set(DYNEMB_HDF5_PRIVATE
  "hdf5[.]h|hdf5_hl[.]h|H5[A-Za-z0-9_]*[.]h|capture/(h5util|h5chunks|h5string|capture_internal|watchdog)[.]hpp")
set(DYNEMB_HDF5_WHY
  "only lib/capture includes libhdf5's headers and capture's private ones (h5util.hpp, h5chunks.hpp, h5string.hpp, capture_internal.hpp, watchdog.hpp): use capture/capture.hpp, batch_source.hpp or merge.hpp")
file(GLOB DYNEMB_LIB_DIRS LIST_DIRECTORIES true RELATIVE ${DYNEMB_ROOT} ${DYNEMB_ROOT}/lib/*)
foreach(dir cli backends bench kernels ${DYNEMB_LIB_DIRS})
  if(IS_DIRECTORY ${DYNEMB_ROOT}/${dir} AND NOT dir STREQUAL "lib/capture")
    dynemb_forbid_includes(${dir} "${DYNEMB_HDF5_PRIVATE}" "${DYNEMB_HDF5_WHY}")
  endif()
endforeach()
