// A small C ABI over c10d (stores, gloo/NCCL process groups, collectives) for the
// featshard runtime. Tensors cross as `at::Tensor*`, which is what a tch Tensor wraps.
// Every entry point returns NULL on success or a malloc'd message the caller frees with
// fs_string_free; no C++ exception crosses the boundary.

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

struct fs_store {
  c10::intrusive_ptr<c10d::Store> store;
};

struct fs_group {
  c10::intrusive_ptr<c10d::Backend> backend;
  std::chrono::milliseconds timeout;
};

namespace {

char* message(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out != nullptr) {
    std::memcpy(out, s.c_str(), s.size() + 1);
  }
  return out;
}

template <typename F>
char* guarded(F&& f) {
  try {
    f();
    return nullptr;
  } catch (const c10::Error& e) {
    return message(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return message(e.what());
  } catch (...) {
    return message("unknown C++ exception in c10d");
  }
}

// Waits for a collective with the group's timeout; a timed-out or failed peer throws.
void finish(fs_group* g, const c10::intrusive_ptr<c10d::Work>& work) {
  work->wait(g->timeout);
}

std::vector<at::Tensor> tensors(at::Tensor* const* ts, size_t n) {
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(*ts[i]);
  }
  return out;
}

}  // namespace

extern "C" {

void fs_string_free(char* s) { std::free(s); }

// Whether `t` is the only tensor that refers to its memory: no other handle on it and
// no view or alias of its storage. Reference counts only grow through a live handle,
// so once this holds it keeps holding until `t` itself is copied or viewed.
bool fs_tensor_sole_owner(const at::Tensor* t) {
  return t->defined() && t->has_storage() && t->use_count() == 1 &&
         t->storage().use_count() == 1;
}

char* fs_tcp_store(const char* host, uint16_t port, bool is_server, int32_t world_size,
                   int64_t timeout_ms, fs_store** out) {
  return guarded([&] {
    c10d::TCPStoreOptions opts;
    opts.port = port;
    opts.isServer = is_server;
    opts.numWorkers = static_cast<size_t>(world_size);
    opts.waitWorkers = true;
    opts.timeout = std::chrono::milliseconds(timeout_ms);
    auto store = c10::make_intrusive<c10d::TCPStore>(std::string(host), opts);
    *out = new fs_store{store};
  });
}

char* fs_hash_store(fs_store** out) {
  return guarded([&] { *out = new fs_store{c10::make_intrusive<c10d::HashStore>()}; });
}

char* fs_prefix_store(const char* prefix, const fs_store* base, fs_store** out) {
  return guarded([&] {
    *out = new fs_store{c10::make_intrusive<c10d::PrefixStore>(std::string(prefix), base->store)};
  });
}

char* fs_store_clone(const fs_store* s, fs_store** out) {
  return guarded([&] { *out = new fs_store{s->store}; });
}

void fs_store_free(fs_store* s) { delete s; }

// `hostname`: the address this rank's gloo device binds to; empty for gloo's default
// (this machine's hostname, falling back to loopback).
char* fs_gloo_group(const fs_store* s, int32_t rank, int32_t size, const char* hostname,
                    int64_t timeout_ms, fs_group** out) {
  return guarded([&] {
    auto timeout = std::chrono::milliseconds(timeout_ms);
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    std::string host(hostname);
    opts->devices.push_back(host.empty()
                                ? c10d::ProcessGroupGloo::createDefaultDevice()
                                : c10d::ProcessGroupGloo::createDeviceForHostname(host));
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(s->store, rank, size, opts);
    *out = new fs_group{pg, timeout};
  });
}

bool fs_nccl_compiled() {
#ifdef USE_C10D_NCCL
  return true;
#else
  return false;
#endif
}

// NCCL on CUDA device `device` (one GPU per rank); an error when built without NCCL.
char* fs_nccl_group(const fs_store* s, int32_t rank, int32_t size, int32_t device,
                    int64_t timeout_ms, fs_group** out) {
  return guarded([&] {
#ifdef USE_C10D_NCCL
    auto timeout = std::chrono::milliseconds(timeout_ms);
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(s->store, rank, size, opts);
    *out = new fs_group{pg, timeout};
#else
    (void)s; (void)rank; (void)size; (void)device; (void)timeout_ms; (void)out;
    throw std::runtime_error("featshard-runtime was built without the `nccl` feature");
#endif
  });
}

void fs_group_free(fs_group* g) { delete g; }

int32_t fs_group_rank(const fs_group* g) { return g->backend->getRank(); }
int32_t fs_group_size(const fs_group* g) { return g->backend->getSize(); }

char* fs_broadcast(fs_group* g, at::Tensor* t, int32_t root) {
  return guarded([&] {
    std::vector<at::Tensor> ts{*t};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.timeout = g->timeout;
    finish(g, g->backend->broadcast(ts, opts));
  });
}

// `inputs` (one per rank, all shaped like `out`) are read on `root` only.
char* fs_scatter(fs_group* g, at::Tensor* out, at::Tensor* const* inputs, size_t n_inputs,
                 int32_t root) {
  return guarded([&] {
    std::vector<at::Tensor> outs{*out};
    std::vector<std::vector<at::Tensor>> ins;
    if (g->backend->getRank() == root) {
      ins.push_back(tensors(inputs, n_inputs));
    }
    c10d::ScatterOptions opts;
    opts.rootRank = root;
    opts.timeout = g->timeout;
    finish(g, g->backend->scatter(outs, ins, opts));
  });
}

char* fs_all_gather(fs_group* g, at::Tensor* const* outs, size_t n_outs, at::Tensor* input) {
  return guarded([&] {
    std::vector<std::vector<at::Tensor>> out{tensors(outs, n_outs)};
    std::vector<at::Tensor> in{*input};
    c10d::AllgatherOptions opts;
    opts.timeout = g->timeout;
    finish(g, g->backend->allgather(out, in, opts));
  });
}

// op: 0 sum, 1 max, 2 min.
char* fs_all_reduce(fs_group* g, at::Tensor* t, int32_t op) {
  return guarded([&] {
    std::vector<at::Tensor> ts{*t};
    c10d::AllreduceOptions opts;
    switch (op) {
      case 0: opts.reduceOp = c10d::ReduceOp::SUM; break;
      case 1: opts.reduceOp = c10d::ReduceOp::MAX; break;
      case 2: opts.reduceOp = c10d::ReduceOp::MIN; break;
      default: throw std::invalid_argument("unknown reduce op " + std::to_string(op));
    }
    opts.timeout = g->timeout;
    finish(g, g->backend->allreduce(ts, opts));
  });
}

char* fs_barrier(fs_group* g) {
  return guarded([&] {
    c10d::BarrierOptions opts;
    opts.timeout = g->timeout;
    finish(g, g->backend->barrier(opts));
  });
}

}  // extern "C"
