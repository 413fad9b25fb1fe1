// The NCCL backend across processes == the CPU reference, under `mpiexec -n 2` (CTest runs it so,
// label gpu). Each process builds make_nccl_backend over its own GPU(s) with a process group whose
// broadcast is MPI_Bcast, so one communicator spans the processes, as nccl-tests builds it with
// MPI=1. Every process makes the same random batches (same seed) and derives the contexts and
// local_embs of all W ranks on the CPU; it then runs the output dist handing the NCCL backend the
// data of its own ranks only (the other ranks' TensorRefs keep their shape and lose their data),
// and compares each own rank's output bit for bit with the CPU reference's; the sink must receive
// exactly its own ranks, in rank order.
//   - one GPU per process: W = 2, 4, 8; two GPUs per process where the host has 2 per process:
//     W = 4, 8;
//   - every NcclOptions variant: reduce-scatter, all-to-all + reduce, intra-GPU blocks through
//     NCCL;
//   - a broken context of the last process's rank is the same OutputDistFailure in every process
//     (no process enters the collective) and the next dist runs;
//   - a W that the GPU count does not divide (W = 3; W = 2 on 4 GPUs) is a UsageError in every
//     process, and the next dist runs.
// Bit for bit on the reduce-scatter path too: the oracle's values are multiples of 2^-6 in
// [-2, 2) and the weights multiples of 2^-2, so every fp32 partial sum here is exact whatever
// NCCL's order (docs/multi-node.md, "Sum order").
//
// Exits 77 (skipped), saying why, in a build without NCCL or MPI, without mpiexec, run alone, or
// with fewer GPUs on a host than processes on it. An unexpected exception ends the job with
// MPI_Abort, as a caller of the backend across processes must (docs/multi-node.md).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#if !defined(DYNEMB_HAVE_NCCL)
int main() {
  std::printf("skipped: built without NCCL (NCCL not found at configure time)\n");
  return 77;
}
#elif !defined(DYNEMB_HAVE_MPI)
int main() {
  std::printf("skipped: built without MPI (-DDYNEMB_MPI=OFF or no MPI found)\n");
  return 77;
}
#else

#define OMPI_SKIP_MPICXX 1  // the C API only
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <exception>
#include <optional>
#include <random>
#include <vector>

#include "engine/input_dist.hpp"
#include "gpu_test_support.hpp"
#include "nccl/nccl_backend.hpp"
#include "random_case.hpp"

using namespace dynemb;

namespace {

int g_proc = 0, g_procs = 1;
int64_t g_checks = 0, g_failures = 0;

// A failed check prints what and where (the process, the case) and counts; the run goes on.
void expect(bool ok, const std::string& what, const std::string& where) {
  ++g_checks;
  if (ok) return;
  ++g_failures;
  std::printf("process %d: FAILED: %s [%s]\n", g_proc, what.c_str(), where.c_str());
  std::fflush(stdout);
}

// Every process's verdict, for a skip all processes take together.
bool all_true(bool mine) {
  int v = mine ? 1 : 0, all = 0;
  MPI_Allreduce(&v, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

NcclProcessGroup process_group() {
  NcclProcessGroup pg;
  pg.index = g_proc;
  pg.size = g_procs;
  pg.broadcast = [](std::string& s) {
    MPI_Bcast(&s[0], static_cast<int>(s.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
  };
  pg.timeout_s = 120;  // a peer that fails ends this one's wait in a DeviceError, not a hang
  return pg;
}

// What a dist did in one process: the outputs by rank, the ranks the sink got in order, or the
// OutputDistFailure (rank, field) / UsageError it threw.
struct Outcome {
  std::vector<EmbTensor> out;
  std::vector<int> sunk;
  int fail_rank = -1;
  std::string fail_field;
  bool usage_error = false;
};

Outcome run_dist(Backend& b, const Plan& plan, bool variable_batch,
                 const std::vector<TensorRef>& local,
                 const std::vector<const ShardingContext*>& cp) {
  Outcome o;
  o.out.assign(static_cast<size_t>(plan.world_size), EmbTensor{});
  auto sink = [&o](int r, Tensor&& t) {
    o.sunk.push_back(r);
    o.out[static_cast<size_t>(r)] = std::move(t.t);
  };
  try {
    if (plan.module == ModuleKind::sequence)
      b.sequence_output_dist(plan, local, cp, Place::host, sink);
    else
      b.pooled_output_dist(plan, variable_batch, local, cp, Place::host, sink);
  } catch (const OutputDistFailure& e) {
    o.fail_rank = e.rank();
    o.fail_field = e.field();
  } catch (const UsageError&) {
    o.usage_error = true;
  }
  return o;
}

// The inputs as one process of the team holds them: data for ranks [r0, r1), the shape (and
// dtype) alone for the others.
std::vector<TensorRef> own_inputs(const std::vector<EmbTensor>& local, int64_t r0, int64_t r1) {
  std::vector<TensorRef> refs(local.begin(), local.end());
  for (int64_t r = 0; r < static_cast<int64_t>(refs.size()); ++r)
    if (r < r0 || r >= r1) refs[r].host = nullptr;
  return refs;
}

// One dist on the CPU (all W ranks) and on the NCCL backend (this process's ranks), compared.
// Returns false when the context failed (alike on both).
bool compare(Backend& nccl, const Plan& plan, bool variable_batch,
             const std::vector<EmbTensor>& local, const std::vector<const ShardingContext*>& cp,
             const std::string& desc) {
  const int64_t W = plan.world_size;
  const std::vector<TensorRef> all(local.begin(), local.end());
  const Outcome want = run_dist(test::cpu(), plan, variable_batch, all, cp);
  const auto [r0, r1] = nccl_process_ranks(W, process_group());
  const Outcome got = run_dist(nccl, plan, variable_batch, own_inputs(local, r0, r1), cp);
  expect(!got.usage_error, "no UsageError", desc);
  expect(got.fail_rank == want.fail_rank && got.fail_field == want.fail_field,
         "the CPU's OutputDistFailure: rank " + std::to_string(want.fail_rank) + " " +
             want.fail_field + ", got rank " + std::to_string(got.fail_rank) + " " + got.fail_field,
         desc);
  if (want.fail_rank >= 0) return false;
  std::vector<int> mine;
  for (int64_t r = r0; r < r1; ++r) mine.push_back(static_cast<int>(r));
  expect(got.sunk == mine, "the sink gets this process's ranks, in order", desc);
  for (int64_t r = r0; r < r1; ++r) {
    const std::string where = desc + ", rank " + std::to_string(r);
    expect(got.out[r].shape == want.out[r].shape, "output shape", where);
    expect(got.out[r].dtype == want.out[r].dtype, "output dtype", where);
    expect(test::same_bits(got.out[r].data, want.out[r].data),
           "output bits (first diff at " +
               std::to_string(test::first_diff(want.out[r].data, got.out[r].data)) + ")",
           where);
  }
  return true;
}

// The contexts and local_embs of all W ranks of a case, on the CPU (the same in every process);
// false when the input dist or the lookup refuses the batch (alike in every process).
bool derive(const test::Case& c, uint64_t seed, DerivedBatch& derived,
            std::vector<EmbTensor>& local) {
  std::vector<const Kjt*> kp;
  for (const Kjt& k : c.kjts) kp.push_back(&k);
  const OracleSource source(seed, c.plan);
  try {
    derived = derive_input_dist(c.plan, kp);
    local = derive_local_embs(c.plan, derived, source, test::cpu(), 0);
  } catch (const Error&) {
    return false;
  }
  return true;
}

std::vector<const ShardingContext*> context_pointers(const std::vector<ShardingContext>& ctx) {
  std::vector<const ShardingContext*> cp;
  for (const ShardingContext& x : ctx) cp.push_back(&x);
  return cp;
}

std::vector<ShardingContext> contexts(const DerivedBatch& d) {
  std::vector<ShardingContext> ctx;
  for (const DerivedRank& r : d.ranks) ctx.push_back(r.ctx);
  return ctx;
}

// What the random cases covered, to check each kind came up.
struct Coverage {
  int sequence = 0, pooled_equal = 0, pooled_unequal = 0, vbe = 0, codec = 0;
};

void random_cases(Backend& nccl, int64_t W, int cases, uint64_t seed, const std::string& config,
                  Coverage& cov) {
  std::mt19937_64 rng(seed);
  for (int i = 0; i < cases; ++i) {
    const test::Case c = test::random_case(rng, i, W);
    DerivedBatch derived;
    std::vector<EmbTensor> local;
    if (!derive(c, 0x5eed2000ULL + seed + static_cast<uint64_t>(i), derived, local)) continue;
    const std::vector<ShardingContext> ctx = contexts(derived);
    if (!compare(nccl, c.plan, derived.variable_batch, local, context_pointers(ctx),
                 config + ", " + c.desc))
      continue;
    // batch_size_per_rank is the same [W] vector in every rank's derived context.
    const std::optional<std::vector<int64_t> >& bs = ctx[0].batch_size_per_rank;
    const bool equal =
        bs && std::all_of(bs->begin(), bs->end(), [&](int64_t b) { return b == bs->front(); });
    if (c.plan.module == ModuleKind::sequence)
      ++cov.sequence;
    else if (derived.variable_batch)
      ++cov.vbe;
    else if (equal)
      ++cov.pooled_equal;
    else
      ++cov.pooled_unequal;
    if (c.plan.comm_precision != DType::f32) ++cov.codec;
  }
}

// A sequence batch whose rank W-1 (the last process's) has a wrong output_splits: every process
// throws the CPU's OutputDistFailure before any collective, and the backend runs the next dist.
void broken_context(Backend& nccl, int64_t W, const std::string& config) {
  std::mt19937_64 rng(99);
  for (int i = 0; i < 200; ++i) {
    const test::Case c = test::random_case(rng, i, W);
    DerivedBatch derived;
    std::vector<EmbTensor> local;
    if (c.plan.module != ModuleKind::sequence || !derive(c, 123, derived, local)) continue;
    std::vector<ShardingContext> ctx = contexts(derived);
    (*ctx[W - 1].output_splits)[0] += 1;
    const std::string desc = config + ", broken output_splits of rank " + std::to_string(W - 1);
    expect(!compare(nccl, c.plan, false, local, context_pointers(ctx), desc),
           "the broken context fails", desc);
    // The same batch mended: every process is still in step with the others.
    (*ctx[W - 1].output_splits)[0] -= 1;
    expect(compare(nccl, c.plan, false, local, context_pointers(ctx), desc + ", then mended"),
           "the mended one runs", desc);
    return;
  }
  expect(false, "a sequence case to break", config);
}

// A W that the G GPUs do not divide: every process refuses alike (UsageError), after the context
// checks and before any collective, and the backend runs the next dist.
void indivisible(Backend& nccl, int64_t W, const std::string& config) {
  std::mt19937_64 rng(5);
  for (int i = 0; i < 50; ++i) {
    const test::Case c = test::random_case(rng, i, W);
    DerivedBatch derived;
    std::vector<EmbTensor> local;
    if (!derive(c, 7, derived, local)) continue;
    const std::vector<ShardingContext> ctx = contexts(derived);
    const std::vector<TensorRef> refs(local.begin(), local.end());
    const Outcome o = run_dist(nccl, c.plan, derived.variable_batch, refs, context_pointers(ctx));
    if (o.fail_rank >= 0) continue;  // a context the checks refuse first: not this case
    expect(o.usage_error, "a UsageError when the GPU count does not divide W", config);
    return;
  }
  expect(false, "a case whose contexts pass the checks", config);
}

// One backend configuration: `per_proc` GPUs per process, starting at this host's share.
void run_config(int local_proc, int per_proc, int cases) {
  std::vector<int> devices;
  for (int i = 0; i < per_proc; ++i) devices.push_back(local_proc * per_proc + i);
  const int G = g_procs * per_proc;
  const std::vector<std::pair<const char*, NcclOptions> > variants = {
      {"default", NcclOptions{true, false}},
      {"a2a+reduce", NcclOptions{false, false}},
      {"intra-gpu-via-nccl", NcclOptions{true, true}},
  };
  for (const auto& [vname, opt] : variants) {
    std::unique_ptr<Backend> nccl = make_nccl_backend(devices, opt, process_group());
    if (g_proc == 0) std::printf("backend: %s (%s)\n", nccl->device().c_str(), vname);
    std::fflush(stdout);
    Coverage cov;
    for (int64_t W : {int64_t{2}, int64_t{3}, int64_t{4}, int64_t{8}}) {
      const std::string config = std::to_string(G) + " GPUs, " + vname + ", W=" + std::to_string(W);
      if (W % G != 0) {
        indivisible(*nccl, W, config);
        continue;
      }
      random_cases(*nccl, W, cases, static_cast<uint64_t>(W * 1000 + G), config, cov);
      broken_context(*nccl, W, config);
    }
    const std::string config = std::to_string(G) + " GPUs, " + vname;
    if (cases < 20) continue;  // too few to expect every kind
    expect(cov.sequence > 0, "random cases cover a sequence dist", config);
    expect(cov.pooled_equal > 0, "random cases cover a pooled dist with equal batches", config);
    expect(cov.pooled_unequal > 0, "random cases cover a pooled dist with unequal batches", config);
    expect(cov.vbe > 0, "random cases cover a VBE pooled dist", config);
    expect(cov.codec > 0, "random cases cover a codec", config);
    if (g_proc == 0)
      std::printf("  %s: sequence %d, pooled equal %d, unequal %d, VBE %d; with a codec %d\n",
                  config.c_str(), cov.sequence, cov.pooled_equal, cov.pooled_unequal, cov.vbe,
                  cov.codec);
  }
}

int run(int argc, char** argv) {
  MPI_Comm_rank(MPI_COMM_WORLD, &g_proc);
  MPI_Comm_size(MPI_COMM_WORLD, &g_procs);
  if (!all_true(g_procs >= 2)) {
    std::printf("skipped: needs 2 processes (run it with mpiexec -np 2), got %d\n", g_procs);
    return 77;
  }
  // The processes of this host share its GPUs: local process i takes GPU i (or 2i, 2i+1).
  MPI_Comm host;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_proc, MPI_INFO_NULL, &host);
  int local_proc = 0, local_procs = 1;
  MPI_Comm_rank(host, &local_proc);
  MPI_Comm_size(host, &local_procs);
  MPI_Comm_free(&host);
  const int visible = nccl_visible_devices();
  if (!all_true(visible >= local_procs)) {
    if (g_proc == 0) std::printf("skipped: needs %d GPUs, found %d\n", local_procs, visible);
    return 77;
  }
  const char* env = argc > 1 ? argv[1] : std::getenv("DYNEMB_GPU_CASES");
  const int cases = env ? std::max(1, std::atoi(env)) : 40;
  run_config(local_proc, 1, cases);
  if (all_true(visible >= 2 * local_procs))
    run_config(local_proc, 2, cases);
  else if (g_proc == 0)
    std::printf("two GPUs per process: not run (needs %d GPUs on a host, found %d)\n",
                2 * local_procs, visible);
  int64_t totals[2] = {0, 0}, mine[2] = {g_checks, g_failures};
  MPI_Allreduce(mine, totals, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  if (g_proc == 0)
    std::printf("%lld checks over %d processes, %lld failed\n", static_cast<long long>(totals[0]),
                g_procs, static_cast<long long>(totals[1]));
  return totals[1] == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--no-mpiexec") {
    std::printf("skipped: no mpiexec (CMake found MPI but not its launcher)\n");
    return 77;
  }
  MPI_Init(&argc, &argv);
  int rc = 1;
  try {
    rc = run(argc, argv);
  } catch (const std::exception& e) {
    // A peer may be waiting in a collective this process will never enter: end them all.
    std::printf("process %d: %s\n", g_proc, e.what());
    std::fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  std::fflush(stdout);
  MPI_Finalize();
  return rc;
}

#endif  // DYNEMB_HAVE_NCCL && DYNEMB_HAVE_MPI
