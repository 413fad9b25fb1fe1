// libFuzzer target: the capture reader fed in-memory HDF5 images (core file driver). Any bytes
// must become a CaptureError / dynemb::Error (exit 2 in the CLI), never a crash, a hang or an
// allocation sized by a claimed extent. Runs what `validate --capture` runs (check_capture:
// root attributes, /plan, /tables shapes, every batch's shapes and sums), then reads every
// batch with its data and the routed-id counts. Seed corpus: fixtures/*.h5.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>

#include "capture/capture.hpp"
#include "common/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    dynemb::CaptureReader reader("fuzz.h5", data, size);
    dynemb::check_capture(reader);
    const dynemb::Plan plan = dynemb::capture_plan(reader);
    for (const dynemb::TableConfig& t : plan.tables)
      for (const std::string& name : reader.weight_tables())
        if (name == t.name) (void)reader.read_table_weight(t);
    // Limit the data read per input (shapes were already checked for every batch).
    for (int64_t k = 0; k < reader.num_batches() && k < 4; ++k) {
      const dynemb::Batch b = reader.read_batch(plan, k);
      for (const dynemb::RankBatch& rb : b.ranks) (void)dynemb::routed_id_counts(plan, rb.kjt);
      (void)reader.dataset_stats(k);
    }
    (void)reader.table_stats();
  } catch (const dynemb::Error&) {
    // the expected outcome for bad bytes
  } catch (const std::bad_alloc&) {
    std::abort();  // an allocation sized by a claimed extent
  } catch (const std::exception&) {
    std::abort();  // any other exception escapes the CLI's exit-2 mapping
  }
  return 0;
}
