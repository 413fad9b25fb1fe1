// The process-wide settings of libhdf5, for callers outside lib/capture (capture.hpp).
#include <hdf5.h>

#include "capture/capture.hpp"
#include "capture/h5chunks.hpp"
#include "capture/h5util.hpp"

namespace dynemb {

void quiet_hdf5_errors() {
  h5::quiet();
}

void prepare_hdf5_library() {
  H5dont_atexit();
  h5::quiet();
}

std::string inflate_library_name() {
  return h5::inflate_library();
}

}  // namespace dynemb
