// Scalar string attributes and datasets of a capture (root `format`, `/plan`, `/oracle` `kind`,
// `dtype`), fixed or variable length, read without libhdf5's variable-length path.
//
// Why: libhdf5 1.10 resolves a variable-length string through its global heap code
// (H5T__conv_vlen -> H5HG_read), which trusts the file: a damaged record or heap makes it
// allocate and zero the claimed length (up to 4 GiB for a 33 KB file), loop forever, or read
// out of bounds and crash (all found by fuzz_capture; docs/robustness.md). Here libhdf5 only
// hands over the element's raw record [u32 length | heap address | u32 object index] (a
// registered conversion to an opaque type, so no heap access), and the string is fetched from
// the file's raw bytes by a bounds-checked reader of the global heap collection ("GCOL",
// HDF5 file format spec, section III.E).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace dynemb::h5 {

// Read-only raw bytes of the HDF5 file that is open as well through libhdf5.
class RawFile {
 public:
  RawFile() = default;
  // Keeps its own read handle to `path` (no handle: every read fails, so a string read
  // reports an error instead of going to libhdf5).
  static RawFile open_path(const std::string& path);
  // A copy of an in-memory image (the core driver keeps its own copy too).
  static RawFile from_image(const void* image, size_t size);

  // n bytes at absolute file offset `offset`; false when any of them is outside the file.
  bool read(uint64_t offset, void* buf, size_t n) const;
  uint64_t size() const { return size_; }

 private:
  std::shared_ptr<std::FILE> file_;
  std::shared_ptr<const std::vector<unsigned char>> image_;
  uint64_t size_ = 0;
};

// The one string of a scalar (or 1-element) string attribute `name` of `obj`. False with
// `why` ("missing attribute", "int64, want a string", "variable-length string: ...") when it
// cannot be read; fixed strings lose their NUL or space padding, all strings end at a NUL.
bool read_string_attr(hid_t obj, const char* name, const RawFile& raw, std::string& out,
                      std::string& why);
// The same for a dataset.
bool read_string_dataset(hid_t dset, const RawFile& raw, std::string& out, std::string& why);
// The strings of a 1-D string dataset (at most `max_count` of them), fixed or variable length,
// through the same bounds-checked paths.
bool read_string_list_dataset(hid_t dset, const RawFile& raw, int64_t max_count,
                              std::vector<std::string>& out, std::string& why);

}  // namespace dynemb::h5
