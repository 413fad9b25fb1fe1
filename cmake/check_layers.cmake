# Layering check, run at configure time (include()) and by the dynemb_check_layers target at
# every build (cmake -DDYNEMB_ROOT=... -P). It fails naming every file that breaks a rule:
#   cli/     includes no CUDA, CUB or NCCL header and no kernels/ header;
#   lib/     includes nothing of kernels/, backends/ or bench/, and a file of lib/X includes
#            only "Y/..." headers of the layers Y at or below X, lowest first: common, html,
#            plan, model, engine, capture, synth, load, replay;
#   kernels/ includes only its own headers, lib/common's and CUDA, CUB or standard headers;
#   HDF5    lives in lib/capture alone: no other file includes libhdf5's headers or capture's
#            private ones.
if(NOT DYNEMB_ROOT)
  set(DYNEMB_ROOT ${PROJECT_SOURCE_DIR})
endif()
set(DYNEMB_LIB_LAYERS common html plan model engine capture synth load replay)
string(REPLACE ";" ", " DYNEMB_LIB_LAYERS_TEXT "${DYNEMB_LIB_LAYERS}")
set(DYNEMB_LAYER_ERRORS "")

# The #include lines of a file (one list entry each).
function(dynemb_include_lines file out)
  file(STRINGS ${file} lines REGEX "^[ \t]*#[ \t]*include")
  set(${out} "${lines}" PARENT_SCOPE)
endfunction()

macro(dynemb_layer_error file line why)
  file(RELATIVE_PATH _rel ${DYNEMB_ROOT} ${file})
  string(STRIP "${line}" _line)
  list(APPEND DYNEMB_LAYER_ERRORS "${_rel}: `${_line}`: ${why}")
endmacro()

function(dynemb_forbid_includes dir regex why)
  file(GLOB_RECURSE files ${DYNEMB_ROOT}/${dir}/*.cpp ${DYNEMB_ROOT}/${dir}/*.hpp
       ${DYNEMB_ROOT}/${dir}/*.h ${DYNEMB_ROOT}/${dir}/*.cu ${DYNEMB_ROOT}/${dir}/*.cuh)
  foreach(f ${files})
    dynemb_include_lines(${f} lines)
    foreach(line ${lines})
      if(line MATCHES "^[ \t]*#[ \t]*include[ \t]*[<\"](${regex})")
        dynemb_layer_error(${f} "${line}" "${why}")
      endif()
    endforeach()
  endforeach()
  set(DYNEMB_LAYER_ERRORS "${DYNEMB_LAYER_ERRORS}" PARENT_SCOPE)
endfunction()

dynemb_forbid_includes(cli "cuda|cub/|nccl|dist_kernels|bucketize|probes|kernels/|cuda/|nccl/|.*[.]cuh"
  "cli/ never includes a CUDA, CUB or NCCL header: go through backends/registry.hpp or bench/")
dynemb_forbid_includes(lib "cuda|cub/|nccl|dist_kernels|kernels/|backends/|bench/|registry|.*[.]cuh"
  "lib/ is host-only and below kernels/, backends/ and bench/")

# lib/: each layer includes only the layers at or below it.
function(dynemb_check_lib_order)
  list(LENGTH DYNEMB_LIB_LAYERS n)
  math(EXPR last "${n} - 1")
  foreach(i RANGE ${last})
    list(GET DYNEMB_LIB_LAYERS ${i} layer)
    list(SUBLIST DYNEMB_LIB_LAYERS 0 ${i} below)
    list(APPEND below ${layer})
    string(REPLACE ";" ", " allowed "${below}")
    file(GLOB_RECURSE files ${DYNEMB_ROOT}/lib/${layer}/*.cpp ${DYNEMB_ROOT}/lib/${layer}/*.hpp)
    foreach(f ${files})
      get_filename_component(here ${f} DIRECTORY)
      dynemb_include_lines(${f} lines)
      foreach(line ${lines})
        if(NOT line MATCHES "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\"")
          continue()
        endif()
        set(path ${CMAKE_MATCH_1})
        set(to "")
        if(path MATCHES "^([a-z_]+)/")
          set(to ${CMAKE_MATCH_1})
        endif()
        list(FIND DYNEMB_LIB_LAYERS "${to}" j)
        if(j LESS 0)
          if(NOT EXISTS ${here}/${path})
            dynemb_layer_error(${f} "${line}"
              "lib/ includes only headers of its layers, as \"layer/name.hpp\" (${DYNEMB_LIB_LAYERS_TEXT})")
          endif()
        elseif(j GREATER i)
          dynemb_layer_error(${f} "${line}"
            "lib/${layer} includes only the lib/ layers at or below it (${allowed}), and ${to} is above it")
        endif()
      endforeach()
    endforeach()
  endforeach()
  set(DYNEMB_LAYER_ERRORS "${DYNEMB_LAYER_ERRORS}" PARENT_SCOPE)
endfunction()
dynemb_check_lib_order()

# kernels/: its own headers (found under kernels/), lib/common's, and <...> headers of CUDA,
# CUB and the standard library; never the other lib/ layers, backends/, bench/, cli/ or NCCL.
function(dynemb_check_kernels)
  set(why "kernels/ includes only its own headers, lib/common's and CUDA, CUB or standard headers")
  file(GLOB_RECURSE files ${DYNEMB_ROOT}/kernels/*.cu ${DYNEMB_ROOT}/kernels/*.cuh
       ${DYNEMB_ROOT}/kernels/*.hpp ${DYNEMB_ROOT}/kernels/*.cpp ${DYNEMB_ROOT}/kernels/*.h)
  foreach(f ${files})
    get_filename_component(here ${f} DIRECTORY)
    dynemb_include_lines(${f} lines)
    foreach(line ${lines})
      if(line MATCHES "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\"")
        set(path ${CMAKE_MATCH_1})
        if(path MATCHES "^common/")
          if(NOT EXISTS ${DYNEMB_ROOT}/lib/${path})
            dynemb_layer_error(${f} "${line}" "no such header in lib/common")
          endif()
        elseif(NOT (EXISTS ${DYNEMB_ROOT}/kernels/${path} OR EXISTS ${here}/${path})
               OR path MATCHES "(^|/)[.][.]/")
          dynemb_layer_error(${f} "${line}" "${why}")
        endif()
      elseif(line MATCHES "^[ \t]*#[ \t]*include[ \t]*<(plan|model|engine|capture|synth|replay|backends|bench|cli|kernels|nccl)[/.]")
        dynemb_layer_error(${f} "${line}" "${why}")
      endif()
    endforeach()
  endforeach()
  set(DYNEMB_LAYER_ERRORS "${DYNEMB_LAYER_ERRORS}" PARENT_SCOPE)
endfunction()
dynemb_check_kernels()

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

if(DYNEMB_LAYER_ERRORS)
  list(LENGTH DYNEMB_LAYER_ERRORS count)
  string(REPLACE ";" "\n" report "${DYNEMB_LAYER_ERRORS}")
  message(FATAL_ERROR "layering broken (${count} include(s), cmake/check_layers.cmake):\n${report}")
endif()
